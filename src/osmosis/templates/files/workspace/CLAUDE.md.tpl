# CLAUDE.md

Read `AGENTS.md` in this directory: it describes the workspace layout, the commands to run and
the rules for configs and secrets. `configs/AGENTS.md` describes the config files.
