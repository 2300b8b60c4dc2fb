"""Coming back from a failure: finding the newest whole checkpoint as each
framework finds it (discovery), and which tier a tiered job restores from
(local_choice). Independent of DLIO and MPI: the collective steps are
callables the caller gives."""
