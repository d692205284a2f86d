"""What counts as a smaller train.py: the code's lines and tokens in one canonical layout, so that
rearranging the text (comments, docstrings, line breaks, names) never makes a change "simpler"."""

from __future__ import annotations

import pytest
from fakes import SMALL_TRAIN_PY

from bot.core.simplicity import Simplification, Size, simplification, size

MAIN = '''"""A tiny training script."""
import math

LR = 0.04  # learning rate
SCALE = 2.0


def step(x):
    """One step."""
    y = x * LR
    y = y * SCALE
    return math.log(y)
'''


def test_the_size_is_counted_on_the_code_alone():
    # import; LR; SCALE; def; three statements: 7 lines. Tokens: import math (2), LR = 0.04 (3),
    # SCALE = 2.0 (3), def step ( x ) : (6), y = x * LR (5), y = y * SCALE (5), return math . log ( y ) (7)
    assert size(MAIN) == Size(lines=7, tokens=31)


@pytest.mark.parametrize(
    "rewritten",
    [
        # comments, docstrings and blank lines gone
        "import math\nLR = 0.04\nSCALE = 2.0\ndef step(x):\n    y = x * LR\n    y = y * SCALE\n    return math.log(y)\n",
        # lines joined with semicolons
        "import math\nLR = 0.04; SCALE = 2.0\ndef step(x):\n    y = x * LR; y = y * SCALE; return math.log(y)\n",
        # an expression split over lines, and redundant parentheses
        MAIN.replace("y = x * LR", "y = (\n        x\n        * LR\n    )"),
        # shorter names
        MAIN.replace("SCALE", "S").replace("step", "f"),
    ],
    ids=["no-comments", "joined-lines", "split-expression", "short-names"],
)
def test_rearranging_the_text_is_not_a_simplification(rewritten):
    assert size(rewritten) == size(MAIN)
    assert simplification(MAIN, rewritten) is None


def test_packing_two_assignments_into_one_line_is_not_a_simplification():
    packed = MAIN.replace("LR = 0.04  # learning rate\nSCALE = 2.0", "LR, SCALE = 0.04, 2.0")
    assert size(packed).lines == size(MAIN).lines - 1
    assert size(packed).tokens > size(MAIN).tokens
    assert simplification(MAIN, packed) is None


def test_deleting_a_constant_and_its_use_is_a_simplification():
    simpler = MAIN.replace("SCALE = 2.0\n", "").replace("    y = y * SCALE\n", "")
    assert simplification(MAIN, simpler) == Simplification(lines=2, tokens=8)
    assert simplification(simpler, MAIN) is None  # adding them back is not


def test_a_change_of_values_only_is_not_a_simplification():
    assert simplification(MAIN, MAIN.replace("0.04", "0.05")) is None


def test_fewer_tokens_on_as_many_lines_is_not_a_simplification():
    shorter = MAIN.replace("y = y * SCALE", "y = SCALE")
    assert size(shorter).tokens < size(MAIN).tokens and size(shorter).lines == size(MAIN).lines
    assert simplification(MAIN, shorter) is None


def test_a_function_left_with_only_its_docstring_still_counts_its_body():
    assert size('def f():\n    """Nothing."""\n') == size("def f():\n    pass\n")


def test_text_that_does_not_parse_has_no_size():
    assert size("def (:\n") is None
    assert simplification(MAIN, "def (:\n") is None
    assert simplification("def (:\n", MAIN) is None


def test_the_words_say_how_much_smaller():
    assert Simplification(lines=37, tokens=412).words() == "37 fewer lines of code (412 fewer code tokens)"
    assert Simplification(lines=1, tokens=1).words() == "1 fewer line of code (1 fewer code token)"


def test_a_deleted_statement_of_a_train_py_counts():
    simpler = SMALL_TRAIN_PY.replace("WARMDOWN_RATIO = 0.5\n", "")
    assert simplification(SMALL_TRAIN_PY, simpler) == Simplification(lines=1, tokens=3)
