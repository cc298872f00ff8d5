"""The Spark Structured Streaming application that folds the Kafka log into Delta tables."""
