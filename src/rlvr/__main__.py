"""`python -m rlvr ...`: the `rlvr` console script, for launchers that start a module
(`torchrun --nproc-per-node N -m rlvr train ...`)."""

from rlvr.cli import main

if __name__ == "__main__":
    main()
