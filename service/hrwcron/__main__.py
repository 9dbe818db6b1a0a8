"""``python -m hrwcron``: the same as the ``hrwcron`` command."""

from hrwcron.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
