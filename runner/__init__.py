"""The fixed harness: profiles, data, tokenizer, packing, evaluation and the time budget.

Everything in this package runs next to the accelerator and is never edited by the agent.
"""
