"""Security scenarios: a test PKI (`bench pki`) and the attacker process that probes a run's ACLs."""
