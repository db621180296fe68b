"""The ``gpupipe`` command and the tools around the library: ingest, index, inspect, validate,
preview, demo, synthetic data, fit and bench. Tools import the library; the library never
imports a tool (tests/test_layout.py holds that)."""
