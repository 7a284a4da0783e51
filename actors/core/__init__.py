"""The actors' sans-I/O cores: every decision of a member (elections aside, which are
:mod:`rayledger.election`'s), its dispatchers, its checker, its state machine runner and its
compiled fast path, with no Ray, asyncio or clock inside.  Events go in, actions come out;
the Ray shells (:mod:`rayledger.actors.member.actor`, :mod:`rayledger.actors.dispatcher`,
:mod:`rayledger.actors.checker`, :mod:`rayledger.actors.fastpath`), the simulation and the
script tests only deliver them.  ``tests/actors/test_core_is_sans_io.py`` fails when a
module here imports Ray or asyncio."""
