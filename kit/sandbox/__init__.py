"""Running untrusted generated code: a separate, limited process that cannot change its own verdict.

    sandbox.py    the parent side: run / run_many, the checker pool, verdicts, test rewriting (start here)
    isolation.py  the runner's layers found once (uid, namespaces, rlimits), cleanup and kills after a run
    wire.py       the plain-data protocol between the parent, the runner and the checker
    runner.py     the child that runs the program and answers calls (read as source, never imported by the kit)
    checker.py    the child that runs the tests in its own namespace (read as source, never imported)
    envhost.py    an environment class (TRL's contract) in a child process: tools with a time limit per call
    envclass.py   what such a class offers and how it is read: tool schemas, argument errors, shares, results
    envpool.py    several such children: world w in child w % k, a round's calls in parallel across them

May import: the standard library only (runner, checker and wire: nothing else at all, they run in the child;
envhost's child imports the environment's own module and transformers for the tools' schemas; envclass imports
dill to send a notebook's class by value).
"""
