"""The .gexec plan: its dataclasses, YAML schema and seal, and the machine identity it is bound to."""
