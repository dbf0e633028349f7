"""Process and file safety: how hetprof starts helper processes and opens files it was given.

Child processes start with no current folder on their path and a guardian that ends them with
their parent; files from someone else are opened as regular files of bounded size. Every stage
uses these, so they sit on the floor below all of them.
"""
