"""The research loop: `conductor` (tick() over main's baseline, proposals, the experiment lifecycle
and runs), `judge` (keep or discard, from numbers alone), `measurement` (which runs count),
`validation` (is a proposal well formed), `program` (program.md's settings), `inbox` (what
arrived, applied in order), `agent_worker` (the agent's own thread) and `driver` (when to tick)."""
