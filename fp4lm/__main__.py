"""`python -m fp4lm ...` is the same as the `fp4lm` command."""

from fp4lm.cli import main

if __name__ == "__main__":
    main()
