"""A notebook as a deployable job: the package written from the notebook's cells, and the job's main."""
