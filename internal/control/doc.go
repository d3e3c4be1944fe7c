// Package control is PandaStack's control plane without HTTP: the one
// error vocabulary the REST API and the E2B API answer with (Kind, Error
// and Classify: a kind, a message written for users and the internal cause,
// which is logged and never shown).
package control
