"""The embedded local stack: jars from Maven, a KRaft broker from those jars, process control."""
