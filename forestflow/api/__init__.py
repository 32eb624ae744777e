"""Front-ends: one module per protocol, all calling the Gateway."""
