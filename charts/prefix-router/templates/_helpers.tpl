{{/* Names, labels, images and the shared blocks of every template. */}}

{{- define "prefix-router.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prefix-router.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Labels of every object; call with (dict "root" $ "component" "operator"). */}}
{{- define "prefix-router.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{ include "prefix-router.selectorLabels" . }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
app.kubernetes.io/part-of: prefix-router
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
{{- with .root.Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "prefix-router.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prefix-router.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "prefix-router.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "prefix-router.operatorName" -}}
{{- printf "%s-operator" (include "prefix-router.fullname" .) -}}
{{- end -}}

{{- define "prefix-router.adapterName" -}}
{{- printf "%s-adapter" (include "prefix-router.fullname" .) -}}
{{- end -}}

{{- define "prefix-router.operatorServiceAccount" -}}
{{- if .Values.operator.serviceAccount.create -}}
{{- default (include "prefix-router.operatorName" .) .Values.operator.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.operator.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "prefix-router.adapterServiceAccount" -}}
{{- if .Values.adapter.serviceAccount.create -}}
{{- default (include "prefix-router.adapterName" .) .Values.adapter.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.adapter.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The operator's leader-election Lease, in the release namespace. */}}
{{- define "prefix-router.leaseName" -}}
{{- printf "%s-leader" (include "prefix-router.operatorName" .) -}}
{{- end -}}

{{- define "prefix-router.peeringName" -}}
{{- default (include "prefix-router.fullname" .) .Values.operator.peering.name -}}
{{- end -}}

{{- define "prefix-router.adapterTLSSecret" -}}
{{- default (printf "%s-serving-cert" (include "prefix-router.adapterName" .)) .Values.adapter.tls.existingSecret -}}
{{- end -}}

{{- define "prefix-router.kedaClientSecret" -}}
{{- printf "%s-keda-client" (include "prefix-router.adapterName" .) -}}
{{- end -}}

{{- define "prefix-router.kedaClientCASecret" -}}
{{- printf "%s-keda-client-ca" (include "prefix-router.adapterName" .) -}}
{{- end -}}

{{/* The Service's DNS names: what the serving certificate is for. */}}
{{- define "prefix-router.adapterDNSNames" -}}
{{- $svc := include "prefix-router.adapterName" . -}}
{{- $ns := .Release.Namespace -}}
{{- list $svc (printf "%s.%s" $svc $ns) (printf "%s.%s.svc" $svc $ns) (printf "%s.%s.svc.%s" $svc $ns .Values.clusterDomain) | toJson -}}
{{- end -}}

{{/*
The adapter's certificates, made once per render and shared by every template that needs them
(the Secrets, the APIService's caBundle, KEDA's trigger authentication, the pods' checksum
annotation): genCA in two templates would make two different CAs. Memoised in the top-level
context, which all templates of the chart share (not in .Values: those are stored with the
release, and the keys would end up there). On upgrades the certificates
already in the cluster are read back with lookup and kept, so an upgrade neither rotates them
nor restarts the adapter; `helm template` (no cluster) makes new ones each time.
Returns JSON: {serving: {ca, crt, key}, kedaClient: {ca, crt, key}}, base64-encoded PEM.
*/}}
{{- define "prefix-router.adapterPKI" -}}
{{- if not (hasKey . "__prefixRouterPKI") -}}
{{- $pki := dict -}}
{{- $days := int .Values.adapter.tls.validityDays -}}
{{- if .Values.adapter.tls.existingSecret -}}
{{- $_ := set $pki "serving" (dict "ca" .Values.adapter.tls.caBundle "crt" "" "key" "") -}}
{{- else -}}
{{- $old := lookup "v1" "Secret" .Release.Namespace (include "prefix-router.adapterTLSSecret" .) -}}
{{- $oldData := dig "data" dict $old -}}
{{- if and (hasKey $oldData "ca.crt") (hasKey $oldData "tls.crt") (hasKey $oldData "tls.key") -}}
{{- $_ := set $pki "serving" (dict "ca" (index $oldData "ca.crt") "crt" (index $oldData "tls.crt") "key" (index $oldData "tls.key")) -}}
{{- else -}}
{{- $ca := genCA (printf "%s-ca" (include "prefix-router.adapterName" .)) $days -}}
{{- $names := include "prefix-router.adapterDNSNames" . | fromJsonArray -}}
{{- $cert := genSignedCert (index $names 2) nil $names $days $ca -}}
{{- $_ := set $pki "serving" (dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc)) -}}
{{- end -}}
{{- end -}}
{{- if .Values.keda.enabled -}}
{{- $old := lookup "v1" "Secret" .Values.keda.namespace (include "prefix-router.kedaClientSecret" .) -}}
{{- $oldData := dig "data" dict $old -}}
{{- $oldCA := lookup "v1" "Secret" .Release.Namespace (include "prefix-router.kedaClientCASecret" .) -}}
{{- $oldCAData := dig "data" dict $oldCA -}}
{{- if and (hasKey $oldData "cert") (hasKey $oldData "key") (hasKey $oldCAData "ca.crt") -}}
{{- $_ := set $pki "kedaClient" (dict "ca" (index $oldCAData "ca.crt") "crt" (index $oldData "cert") "key" (index $oldData "key")) -}}
{{- else -}}
{{- $ca := genCA (printf "%s-keda-client-ca" (include "prefix-router.adapterName" .)) $days -}}
{{- $cert := genSignedCert .Values.keda.clientCertificate.commonName nil nil $days $ca -}}
{{- $_ := set $pki "kedaClient" (dict "ca" ($ca.Cert | b64enc) "crt" ($cert.Cert | b64enc) "key" ($cert.Key | b64enc)) -}}
{{- end -}}
{{- end -}}
{{- $_ := set . "__prefixRouterPKI" $pki -}}
{{- end -}}
{{- toJson (get . "__prefixRouterPKI") -}}
{{- end -}}

{{- define "prefix-router.podSecurityContext" -}}
{{- toYaml .Values.podSecurityContext -}}
{{- end -}}

{{- define "prefix-router.containerSecurityContext" -}}
{{- toYaml .Values.containerSecurityContext -}}
{{- end -}}

{{/*
The operator's permissions in the namespaces it serves, derived from what it does
(operator/prefix_operator): each rule says which code needs it. Rendered into a ClusterRole
(all namespaces) or into a Role per watched namespace. tests/k8s/test_chart.py checks that they
are exactly what the code needs (children.permissions() and the router Role the operator
hands out): nothing missing, nothing more.
*/}}
{{- define "prefix-router.operatorNamespacedRules" -}}
# The models: kopf lists and watches them and patches its finalizer and progress annotations
# (handlers.py); the reconciler reads them (kube.get_model).
- apiGroups: [prefixrouter.io]
  resources: [prefixroutedmodels]
  verbs: [get, list, watch, patch]
# Conditions, replica counts and routing figures (kube.patch_model_status).
- apiGroups: [prefixrouter.io]
  resources: [prefixroutedmodels/status]
  verbs: [patch]
# What a model owns (the table in children.py, from which tests/k8s/test_chart.py derives these
# rules): read before each apply (get), server-side apply (patch, and create when the object is
# new), watched for drift (list, watch), and pruned when the spec no longer needs it (delete:
# only the kinds of which the spec can turn a child off: the managed Redis and the HPA).
- apiGroups: [""]
  resources: [serviceaccounts, configmaps]
  verbs: [get, list, watch, create, patch]
- apiGroups: [""]
  resources: [services]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [apps]
  resources: [deployments]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [autoscaling]
  resources: [horizontalpodautoscalers]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [policy]
  resources: [poddisruptionbudgets]
  verbs: [get, list, watch, create, patch]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, list, watch, create, patch]
# The engine pods: each one's deletion cost, from what only it holds (cost_writer.py).
- apiGroups: [""]
  resources: [pods]
  verbs: [list, patch]
# The router Role the operator creates grants these; Kubernetes lets a subject write a Role
# only with permissions it holds itself, which needs no escalate or bind verb.
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [get, list, watch]
# An external cache store's password (spec.cacheStore.passwordSecretRef): read, never written.
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
# Events on the models: the reconciler's (Created, DriftRepaired, ...) and kopf's.
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- if and .Values.operator.peering.enabled .Values.operator.watchNamespaces }}
# kopf peering of a namespaced operator: keep-alives in the namespace's KopfPeering.
- apiGroups: [kopf.dev]
  resources: [kopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}

{{- define "prefix-router.operatorClusterRules" -}}
# kopf notices CRDs appearing and changing at run time (its resource observer).
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.operator.watchNamespaces }}
# kopf's namespace observer of a namespaced operator.
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- else if .Values.operator.peering.enabled }}
# kopf peering of a cluster-wide operator: keep-alives in the ClusterKopfPeering.
- apiGroups: [kopf.dev]
  resources: [clusterkopfpeerings]
  verbs: [get, list, watch, patch]
{{- end }}
{{- end -}}
