"""Runners: where a run happens, one file per engine (`local`: a sandboxed subprocess per slot,
`actions`: GitHub Actions on self-hosted runners, `modal`: Modal GPUs). The interface they
implement is bot.core.protocols.Runner; `specs` converts between the conductor's Job and RunResult
and the harness's JobSpec and ResultSpec (runner.protocol); `journal` is a remote runner's memory
of its runs."""
