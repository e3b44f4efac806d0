"""``vllmmlxctl`` exit codes, LSB-style so ``status`` works in init scripts and health checks."""

OK = 0
ERROR = 1  # the command ran and failed: a bad config, a failed reload, an unknown model
USAGE = 2  # argparse's own code for bad arguments
NOT_READY = 3  # `status`: the daemon answered but some model is not ready (LSB "not running")
UNREACHABLE = 4  # no daemon answered on the socket (LSB "status unknown")
DOCTOR_FAILED = 5  # `doctor`: a check failed; the report's last line (and --json's "failed") names it
