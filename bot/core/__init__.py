"""The ground floor: the vocabulary every layer speaks. `records` (what passes between the loop and
its collaborators), `states` (an experiment's and a run's states, the moves between them) and
`protocols` (Forge, Runner, Agent, Publisher). Nothing here imports another bot package."""
