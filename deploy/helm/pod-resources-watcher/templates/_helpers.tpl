{{/* The chart's name, and the objects' name: the release name when it already says it. */}}
{{- define "prw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prw.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "prw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prw.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "prw.labels" -}}
{{ include "prw.selectorLabels" . }}
app.kubernetes.io/part-of: pod-resources-watcher
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The agent's user, which the admission policy and the ClusterRoleBinding name. */}}
{{- define "prw.serviceAccountUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:{{ include "prw.fullname" . }}
{{- end -}}

{{/* config.toml: the value, or the chart's copy of deploy/kubernetes/config.toml; with reporting on,
     the `kubernetes` sink's table appended (what deploy/kubernetes/reporting/config.toml adds). */}}
{{- define "prw.config" -}}
{{- $config := .Values.config | default (.Files.Get "files/config.toml") -}}
{{- if .Values.kubernetesReporting.enabled -}}
{{- $config = printf "%s%s" $config (.Files.Get "files/kubernetes-sink.toml") -}}
{{- end -}}
{{- $config -}}
{{- end -}}
