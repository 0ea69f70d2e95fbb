from cluster.jobmanager.entrypoint import main

main()
