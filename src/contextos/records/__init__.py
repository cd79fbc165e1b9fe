"""Records the rooms share: policy decisions, interrupts and approvals, deadlines.

They sit with the core (events, runs, the fold) and import nothing above it: the policy room
decides with them, the tool runner raises them, the fold builds them, the faces show them.
"""
