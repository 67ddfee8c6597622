{{/*
The labels of every object: kustomize's (app.kubernetes.io/part-of) and
Helm's own. Selectors use app.kubernetes.io/name alone, as the kustomize
base does, so a Deployment installed by either can be upgraded by the other.
*/}}
{{- define "trainwire.labels" -}}
app.kubernetes.io/part-of: trainwire
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- end }}

{{/* repository:tag, or repository@digest when a digest is set. */}}
{{- define "trainwire.imageRef" -}}
{{- if .digest -}}
{{ .repository }}@{{ .digest }}
{{- else -}}
{{ .repository }}:{{ .tag }}
{{- end -}}
{{- end }}

{{- define "trainwire.image" -}}
{{- $tag := .Values.image.tag | default .Chart.AppVersion -}}
{{ include "trainwire.imageRef" (dict "repository" .Values.image.repository "tag" $tag "digest" .Values.image.digest) }}
{{- end }}

{{/* The cluster's DNS domain. */}}
{{- define "trainwire.clusterDomain" -}}
{{ .Values.clusterDomain | default "cluster.local" }}
{{- end }}

{{/* Pod placement and pull secrets, from one component's values. */}}
{{- define "trainwire.placement" -}}
{{- with .component.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .component.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .component.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
