// Package helmtest tests the Helm chart in deploy/helm/weir: it renders the
// chart with Helm's Go library for every values file in the chart's ci
// directory, decodes every rendered object strictly into the Kubernetes
// API types (an unknown or misspelt field fails), runs the real weir serve
// with the rendered arguments to check the probes, and keeps the plain
// manifests in deploy/kubernetes in step with the chart.
//
// It is a module of its own so that weir's module does not depend on Helm.
package helmtest
