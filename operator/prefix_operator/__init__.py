"""The PrefixRoutedModel operator: kopf handlers at the edge, pure rendering and status inside."""

GROUP = "prefixrouter.io"
VERSION = "v1alpha1"
PLURAL = "prefixroutedmodels"
KIND = "PrefixRoutedModel"
API_VERSION = f"{GROUP}/{VERSION}"
FIELD_MANAGER = "prefix-operator"
