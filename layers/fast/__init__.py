"""Fast kernels (numba + BLAS), selected by ``Layer.use_fast_kernels``; layers/kernels.py
holds the numpy reference each of them is tested against."""
