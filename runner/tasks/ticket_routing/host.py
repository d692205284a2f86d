"""The router's host: the one process of a ticket-routing evaluation that runs router.py's code.

Started by the evaluator (runner.tasks.ticket_routing.evaluation) in a sandbox that sees router.py
and the training split, nothing of the hold-out: `python -I host.py ROUTER TRAIN_JSONL`. Standard
library only, run as a script (no package of this project is imported before the router).

It imports ROUTER, calls `train(examples)` with the training split's (text, queue) pairs, then
answers the evaluator's batches. One JSON object a line each way:

    host -> {"ready": true, "train_seconds": S}        once train() returned
    evaluator -> {"texts": [...]}                       one batch of hold-out texts
    host -> {"labels": [...]}                           route(texts)'s answer, as it came back
    host -> {"unreadable": "..."}                       route() returned what JSON cannot carry
    host -> {"error": "traceback"} and exit 1           train() or route() raised

Only the host writes the answers, on a private copy of its standard output: before the router is
imported, descriptor 1 and sys.stdout are pointed at standard error (the run's log), so what the
router prints never reaches the evaluator as an answer. The evaluator checks every answer itself.
"""

import importlib.util
import json
import os
import sys
import time
import traceback


def main() -> int:
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")  # not inherited by what the router starts
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def answer(message: dict) -> None:
        answers.write(json.dumps(message) + "\n")
        answers.flush()

    router_path, train_path = sys.argv[1], sys.argv[2]
    try:
        with open(train_path, encoding="utf-8") as handle:
            examples = [(row["text"], row["queue"]) for row in map(json.loads, handle)]
        spec = importlib.util.spec_from_file_location("router", router_path)
        router = importlib.util.module_from_spec(spec)
        sys.modules["router"] = router
        spec.loader.exec_module(router)
        started = time.perf_counter()
        router.train(examples)
        answer({"ready": True, "train_seconds": round(time.perf_counter() - started, 3)})
        for line in sys.stdin:
            labels = router.route(json.loads(line)["texts"])
            try:
                answer({"labels": labels})
            except (TypeError, ValueError):
                answer({"unreadable": f"route() returned a {type(labels).__name__}, not a list of strings"})
    except BaseException:  # SystemExit too: the router's own exit is its crash
        traceback.print_exc()
        answer({"error": traceback.format_exc()[-4000:]})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
