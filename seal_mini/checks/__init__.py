"""The kit's checks of itself, each a command: scripted policies through the environment and checker (oracle),
injected faults through the diagnoser (diagnose-check), speed (bench), memory and speed of a recipe
(preflight), and the main recipe on one card (gpu-check). They import the method; the method never imports
them (tests/test_layout.py). BFCL played by BFCL's own code beside the kit is a test: tests/differential.py."""
