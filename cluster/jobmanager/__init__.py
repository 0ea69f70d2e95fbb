"""The JobManager process: Dispatcher, ResourceManager and one JobMaster per job."""
