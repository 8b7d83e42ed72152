"""Text kernels: StringConcat, StringSplit, StringNormalizer, RegexFullMatch and
TfIdfVectorizer.  STRING tensors live on the host, so in a cuda context these kernels
still run on the host with NumPy (object arrays of Python str); TfIdfVectorizer moves its
float output to the context's device."""
