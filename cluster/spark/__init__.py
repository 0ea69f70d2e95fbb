"""The Spark runner, one package: the chain of Spark steps, Arrow to and from the JVM, kept plans, local batches, fusion, memory, the Java helpers and the stage that feeds them."""
