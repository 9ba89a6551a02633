"""scripts/bench, in modules named for what they do: cli (the options and the modes), setup (the
one setup and its clean-up), contenders, fixtures, workloads (the comparison), report, figures
and targets (its page), link, search, reads, server, shared, follow, scale, dav (the other
modes), pages (their page), api and util (helpers)."""
