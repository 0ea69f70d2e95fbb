from kernel_runtime.cli.main import main

main()
