"""The persistent CUDA form: a site's engines serialised onto one block, the order proved before it is printed."""
