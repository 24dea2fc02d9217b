{{/* The chart's name, and the objects' name: the release name when it already says it. */}}
{{- define "prw.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "prw.fullname" -}}
{{- include "prw.checkNames" . -}}
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

{{/* The names every object is made of, checked before any is used: the namespace and the service
     account's name end up inside the admission policy's CEL, so they must be names Kubernetes
     accepts, never text that could close the string literal they sit in. */}}
{{- define "prw.checkNames" -}}
{{- $label := "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$" -}}
{{- if not (and (le (len .Release.Namespace) 63) (regexMatch $label .Release.Namespace)) -}}
{{- fail (printf "the release namespace %q is not a namespace name: lowercase letters, digits and '-', at most 63 characters" .Release.Namespace) -}}
{{- end -}}
{{- if not (regexMatch "^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$" .Release.Name) -}}
{{- fail (printf "the release name %q is not a Kubernetes object name: lowercase letters, digits, '-' and '.'" .Release.Name) -}}
{{- end -}}
{{- end -}}

{{- define "prw.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prw.name" . | quote }}
app.kubernetes.io/instance: {{ .Release.Name | quote }}
{{- end -}}

{{- define "prw.labels" -}}
{{ include "prw.selectorLabels" . }}
app.kubernetes.io/part-of: pod-resources-watcher
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | quote }}
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

{{/* The image: repository@digest when a digest is given (the tag then only names it to people),
     else repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "prw.image" -}}
{{- $image := .Values.image -}}
{{- if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository ($image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}
