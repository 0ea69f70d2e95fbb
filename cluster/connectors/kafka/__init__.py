"""Apache Kafka connectors: KafkaSource and KafkaSink (issue 34), on confluent-kafka."""
