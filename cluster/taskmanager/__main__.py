from .task_executor import main

main()
