"""The runs pages read: the shared decode (`run.Run`, kept in `store.RunStore`, read through each session's
`runner.Runner`), eviction's pairs, labs and experiments, the served class of the Serving view, the class's shared
prefix cache, and the turns by which pages compute and draw (`turns`)."""
