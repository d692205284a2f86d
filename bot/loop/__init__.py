"""The research loop. `conductor` holds tick(), the one page that orchestrates the others:

    baseline      main read once per tick, its own baseline runs, blocked when it cannot be measured
    proposals     asking the agent (through `agent_worker`, its own thread), taking or refusing its answer
    lifecycle     each experiment from its proposal to merge and close, and what people asked for
    runs          runs started on free slots, their results recorded or refused, lost runs run again
    inbox         what arrived (webhooks, polls, the CLI), applied in order through a router
    driver        when to tick: when something arrives, and on a slow timer

and the rules they share: `judge` (keep or discard, from numbers alone), `measurement` (which runs
count, main's value, the noise), `validation` (is a proposal well formed), `program` (program.md's
settings)."""
