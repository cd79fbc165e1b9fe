"""`python -m contextos.evidence.schemas`: rewrite the kept schemas from the models."""

from contextos.evidence.schemas import write

for written in write():
    print(written)
