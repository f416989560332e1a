"""The archive tier: every chunk kept on disk (archive/), and what a question reads, the working
memory or a replay of archived chunks, with how far back it reaches (tier.py)."""
