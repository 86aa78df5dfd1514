"""Why a job died: the failure categories, the log signatures, the scanners and the ranking."""
