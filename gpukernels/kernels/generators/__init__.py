"""Generator operators: EyeLike, Range and the random operators."""
