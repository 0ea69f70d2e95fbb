from cluster.taskmanager.task_executor import main

main()
