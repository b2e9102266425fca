// Package devenv gives the examples and the CLI the service endpoints that
// `scripts/services.sh env` exports, with the script's defaults.
package devenv
