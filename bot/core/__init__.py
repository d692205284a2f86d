"""The ground floor: the vocabulary every layer speaks. `records` (what passes between the loop and
its collaborators), `states` (an experiment's and a run's states, the moves between them),
`protocols` (Forge, Runner, Agent, Publisher), `router` (which handler applies each kind of inbox
entry), `errors` (ConfigError, a setting to fix) and `simplicity` (how much smaller a change makes
train.py, which the judge and the pull request's texts both speak of). Nothing here imports another bot package."""
