{{/*
Contradictions in the values that the schema cannot express: fail early with a message saying how
to fix them. Included by every template through the operator Deployment.
*/}}
{{- define "posttrain-operator.preflight" -}}
{{- if .Values.hfJobs.enabled }}
{{- if not .Values.hfJobs.tokenSecret.name }}
{{- fail "hfJobs.enabled is true but hfJobs.tokenSecret.name is empty: create a Secret holding the HF token (kubectl create secret generic hf-token --from-literal=token=hf_...) and set hfJobs.tokenSecret.name; the token itself is never a chart value" }}
{{- end }}
{{- if not .Values.hfJobs.namespace }}
{{- fail "hfJobs.enabled is true but hfJobs.namespace is empty: set the HF user or organisation that runs and pays for the jobs (it is never guessed)" }}
{{- end }}
{{- if not .Values.hfJobs.image }}
{{- fail "hfJobs.enabled is true but hfJobs.image is empty: build the launcher image (make images), push it where HF Jobs can pull it, and set hfJobs.image to it; no public image is published for you" }}
{{- end }}
{{- end }}
{{- if and .Values.pods.enabled (not .Values.pods.storeVolume) }}
{{- fail "pods.enabled is true but pods.storeVolume is empty: set the artifact store as an inline volume source (one of csi, nfs, hostPath) that every namespace can mount" }}
{{- end }}
{{- if and .Values.gateway.enabled (eq .Values.gateway.defaultBackend "hf-jobs") (not .Values.hfJobs.enabled) .Values.pods.enabled }}
{{- fail "gateway.defaultBackend is hf-jobs but only the pods backend is enabled: set gateway.defaultBackend=pods" }}
{{- end }}
{{- if and .Values.gateway.enabled (eq .Values.gateway.defaultBackend "pods") (not .Values.pods.enabled) }}
{{- fail "gateway.defaultBackend is pods but pods.enabled is false" }}
{{- end }}
{{- if and .Values.gateway.ingress.enabled (not .Values.gateway.ingress.hosts) }}
{{- fail "gateway.ingress.enabled is true but gateway.ingress.hosts is empty: name the host(s) clients reach the gateway at (the gateway accepts only the Host headers it is told)" }}
{{- end }}
{{- if and .Values.gateway.httpRoute.enabled (not (and .Values.gateway.httpRoute.parentRefs .Values.gateway.httpRoute.hostnames)) }}
{{- fail "gateway.httpRoute.enabled is true but gateway.httpRoute.parentRefs or gateway.httpRoute.hostnames is empty: name the Gateway(s) it attaches to and the host name(s) it routes (the gateway accepts only the Host headers it is told)" }}
{{- end }}
{{- if and .Values.operator.watchNamespaces .Values.gateway.enabled (not (has (include "posttrain-operator.gatewayEpisodeNamespace" .) .Values.operator.watchNamespaces)) }}
{{- fail (printf "the gateway creates Episodes in namespace %q, which operator.watchNamespaces does not include" (include "posttrain-operator.gatewayEpisodeNamespace" .)) }}
{{- end }}
{{- end }}
