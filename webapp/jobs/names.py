"""What a job's, a stage's and a host's name may be: the patterns the API checks (with
``re.fullmatch``) and its OpenAPI schema shows, written in the regex syntax that Python and
JSON Schema (ECMA 262) read alike. No Django here: tools that read the schema import it too."""

HOST_NAME = r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$"
# A stage's name may also join fused stages with '+' ("read+parse": agents.pipeline.fusion).
STAGE_NAME = r"^[A-Za-z][A-Za-z0-9_.+-]{0,63}$"
# Text that is not blank once trimmed (DRF trims it) and holds no NUL (PostgreSQL stores none):
# a job's name.
NOT_BLANK_TEXT = r"^[^\x00]*[^\s\x00][^\x00]*$"
# Text without NUL, not empty (a field that may be blank allows "" besides).
NON_EMPTY_TEXT = r"^[^\x00]+$"
