"""Tree ensembles of XGBoost, LightGBM and scikit-learn, read into one flattened form and scored in C.

``forest`` holds that form (:class:`~forestflow.runtime.trees.forest.Forest`) and its checks; one
reader module per format fills it (``xgboost_reader``, ``lightgbm_reader``, ``sklearn_reader``);
``servable`` is the flavors' shared servable and ``inputs`` maps a Frame to the kernel's matrix.
"""
