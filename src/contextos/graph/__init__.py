"""The graph layer: child runs under delegation contracts, and workflows of typed nodes."""
