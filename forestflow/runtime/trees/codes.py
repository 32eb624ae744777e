"""The codes of the C kernel's node table and parameters (as in _forest.c), shared by the forest and its layouts."""

#: Node table columns and flags.
FEATURE, LEFT, RIGHT, FLAGS, CAT_START, CAT_WORDS = range(6)
DEFAULT_LEFT, CATEGORICAL, IN_SET_LEFT = 1, 2, 4
MISSING_NAN, MISSING_NONE, MISSING_ZERO = 0, 1, 2
MISSING_SHIFT = 3
#: Numeric comparisons (left when): x < t in float32 (XGBoost), x <= t (LightGBM, scikit-learn's
#: histogram GBMs), float32(x) <= t (scikit-learn's trees).
LT_F32, LE, LE_X_F32 = 0, 1, 2
#: Links applied to each row's sums.
IDENTITY, SIGMOID, SOFTMAX, EXP = 0, 1, 2, 3
