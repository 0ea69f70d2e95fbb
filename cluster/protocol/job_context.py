"""How a job script learns where to submit: environment variables set by whoever runs it.

``streamlab run`` sets them for the script it runs, and an application-mode JobManager for the
``main()`` it runs in its own process; ``StreamEnvironment.execute()`` reads them. Unset, a script
starts an embedded cluster of its own.
"""
CONTEXT_CLUSTER_DIR = "STREAMLAB_CONTEXT_CLUSTER_DIR"  # the cluster directory to submit to
CONTEXT_DETACHED = "STREAMLAB_CONTEXT_DETACHED"  # "1": submit and return the job id
CONTEXT_VERBOSE = "STREAMLAB_CONTEXT_VERBOSE"  # "1": print the job's progress
CONTEXT_SAVEPOINT = "STREAMLAB_CONTEXT_SAVEPOINT"  # start from this savepoint
CONTEXT_ALLOW_NON_RESTORED = "STREAMLAB_CONTEXT_ALLOW_NON_RESTORED"  # "1": leave out its state that fits no operator
# "1": print what starting from the savepoint would do with each operator's state, submit nothing
CONTEXT_DRY_RUN = "STREAMLAB_CONTEXT_DRY_RUN"
