"""Runner checkpoints under torch's weights-only unpickling (torch >= 2.6 loads that way).

placeholder: filled once the saved types are measured
"""


def install_checkpoint_allowlist() -> None:
    pass
