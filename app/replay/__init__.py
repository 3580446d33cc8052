"""What ``kvscope replay`` prints and records beside its command: the tables, the answer and the figure of a sweep, and the recording of its points."""
