"""Test helpers shipped in the wheel: the contract suite, look-alike servers, the tiny-model builder."""
