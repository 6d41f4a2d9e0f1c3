"""The pure maths of every algorithm: functions of arrays and tensors, no model, no file, no state.

    magrpo.py        joint actions (aligned/cross), tree returns, group-relative advantages (paper Eq. 1)
    advantages.py    the step's returns up the tree and its advantages (grouping, role baseline, local mix)
    losses.py        the update's per-token maths: log-probs through the chunked head, rollout correction, every
                     loss form and reduction (paper Eq. 2 and TRL's options)
    actor_critic.py  IAC/MAAC value targets, advantages and the value loss (CoMLRL's actor-critic trainers)
    preference.py    pair selection and the DPO-style losses (CoMLRL's preference trainers)

May import: numpy, torch and the standard library; no other kit module (the bottom layer). Each function carries
the equation it implements and has a hand-computed test.
"""
